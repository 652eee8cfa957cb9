//! Why an agent stopped early: the one error every agent, tool wrapper, callback and plugin
//! returns, and how a store error looks to the client inside a run.

/// Why an agent stopped early.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentError {
    /// The run was cancelled (client disconnect, cancel request, timeout, shutdown).
    #[error("invocation cancelled")]
    Cancelled,
    /// The agent (or a callback, plugin, model or tool) failed. `kind` names the error class
    /// the way ADK's SSE error does (`RuntimeError: …`).
    #[error("{kind}: {message}")]
    Failed { kind: String, message: String },
    /// A complete event could not be committed; the run stops.
    #[error("CommitError: {0}")]
    Commit(String),
}

impl From<crate::transcript::CommitError> for AgentError {
    fn from(e: crate::transcript::CommitError) -> Self {
        AgentError::Commit(e.0)
    }
}

impl AgentError {
    /// A store error as the client may see it: what the request can act on (a missing
    /// session, an oversize artifact) in words, a database failure only as a generic sentence
    /// (the detail goes to the log, never into an event, an SSE error or `GET /runs`).
    pub fn store(e: crate::store::StoreError) -> Self {
        use crate::store::StoreError as E;
        match e {
            E::Database(_) | E::Migrate(_) | E::Corrupt(_) => {
                tracing::error!(error = %e, "store error during a run");
                AgentError::failed("StoreError", "a database error interrupted the run")
            }
            other => AgentError::failed("StoreError", other.to_string()),
        }
    }

    pub fn failed(kind: impl Into<String>, message: impl Into<String>) -> Self {
        AgentError::Failed {
            kind: kind.into(),
            message: message.into(),
        }
    }

    /// The error class ADK puts in `error_details.error_type`.
    pub fn kind(&self) -> &str {
        match self {
            AgentError::Cancelled => "CancelledError",
            AgentError::Failed { kind, .. } => kind,
            AgentError::Commit(_) => "CommitError",
        }
    }

    pub fn message(&self) -> String {
        match self {
            AgentError::Cancelled => "invocation cancelled".into(),
            AgentError::Failed { message, .. } => message.clone(),
            AgentError::Commit(m) => m.clone(),
        }
    }
}

pub type AgentResult<T = ()> = Result<T, AgentError>;

#[cfg(test)]
mod tests {
    #[test]
    fn database_errors_reach_clients_only_as_a_generic_sentence() {
        let e = crate::store::StoreError::Database(sqlx::Error::Protocol(
            "relation secret_table".into(),
        ));
        let agent = super::AgentError::store(e);
        assert!(
            !agent.message().contains("secret_table"),
            "{}",
            agent.message()
        );
        let e = crate::store::StoreError::SessionNotFound;
        assert_eq!(super::AgentError::store(e).message(), "session not found");
    }
}
