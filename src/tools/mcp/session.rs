//! The connection to one MCP server: started on first use, re-established after a transport
//! failure, closed with the toolset; a child's stderr tail goes into error messages.

use super::*;

impl Inner {
    pub(super) async fn list_tools(self: &Arc<Self>) -> Result<Vec<Arc<McpTool>>, ToolError> {
        let mut st = self.state.lock().await;
        if st.closed {
            return Err(ToolError::new("the MCP toolset is closed"));
        }
        let alive = st.session.as_ref().is_some_and(Session::is_alive);
        let changed = st
            .session
            .as_ref()
            .is_some_and(|s| s.tools_changed.swap(false, Ordering::Relaxed));
        if let (true, false, Some((tools, at))) = (alive, changed, &st.tools) {
            if self.cache_ttl.is_none_or(|ttl| at.elapsed() < ttl) {
                return Ok(tools.clone());
            }
        }
        st.tools = None;

        let mut reconnected = false;
        loop {
            if !st.session.as_ref().is_some_and(Session::is_alive) {
                self.replace_session(&mut st).await?;
                reconnected = true;
            }
            let peer = st.session.as_ref().map(|s| s.service.peer().clone());
            let Some(peer) = peer else {
                return Err(ToolError::new("no MCP session"));
            };
            let listed = tokio::time::timeout(self.connect_timeout, peer.list_all_tools()).await;
            match listed {
                Ok(Ok(listed)) => {
                    let tools = self.build_tools(listed);
                    st.tools = Some((tools.clone(), Instant::now()));
                    return Ok(tools);
                }
                Ok(Err(e)) if is_transport_error(&e) && !reconnected => {
                    tracing::warn!(server = %self.label, error = %e, "MCP connection broke; reconnecting");
                    Self::drop_session(&mut st);
                }
                Ok(Err(e)) => {
                    if is_transport_error(&e) {
                        Self::drop_session(&mut st);
                    }
                    return Err(ToolError(format!(
                        "listing the MCP server's tools failed: {}",
                        service_error(&e)
                    )));
                }
                Err(_) => {
                    Self::drop_session(&mut st);
                    return Err(ToolError(format!(
                        "the MCP server did not list its tools within {} s",
                        self.connect_timeout.as_secs_f64()
                    )));
                }
            }
        }
    }

    /// Wraps the listed MCP tools: filter (by the server's names), prefix, skip reserved
    /// names, sort by name (a stable order keeps model prompt caches warm).
    pub(super) fn build_tools(
        self: &Arc<Self>,
        listed: Vec<rmcp::model::Tool>,
    ) -> Vec<Arc<McpTool>> {
        let mut tools = Vec::new();
        for t in listed {
            let mcp_name = t.name.to_string();
            if let Some(filter) = &self.filter {
                if !filter.contains(&mcp_name) {
                    continue;
                }
            }
            let name = match &self.prefix {
                Some(p) if p.ends_with('_') => format!("{p}{mcp_name}"),
                Some(p) => format!("{p}_{mcp_name}"),
                None => mcp_name.clone(),
            };
            if RESERVED_NAMES.contains(&name.as_str()) {
                tracing::warn!(server = %self.label, tool = %name, "skipping MCP tool: the name is reserved");
                continue;
            }
            let description = t
                .description
                .as_deref()
                .map(str::to_string)
                .or(t.title.clone())
                .unwrap_or_default();
            let retry_safe = t
                .annotations
                .as_ref()
                .is_some_and(|a| a.read_only_hint == Some(true) || a.idempotent_hint == Some(true));
            tools.push(Arc::new(McpTool {
                name,
                mcp_name,
                description,
                parameters: Value::Object((*t.input_schema).clone()),
                retry_safe,
                set: Arc::downgrade(self),
            }));
        }
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools
    }

    /// A live session's peer (connecting if there is none) and the session's generation.
    pub(super) async fn peer(self: &Arc<Self>) -> Result<(Peer<RoleClient>, u64), ToolError> {
        let mut st = self.state.lock().await;
        if st.closed {
            return Err(ToolError::new("the MCP toolset is closed"));
        }
        if !st.session.as_ref().is_some_and(Session::is_alive) {
            self.replace_session(&mut st).await?;
        }
        match &st.session {
            Some(s) => Ok((s.service.peer().clone(), s.generation)),
            None => Err(ToolError::new("no MCP session")),
        }
    }

    /// Drops the session a failed call used, unless it was already replaced.
    pub(super) async fn invalidate(&self, generation: u64) {
        let mut st = self.state.lock().await;
        if st
            .session
            .as_ref()
            .is_some_and(|s| s.generation == generation)
        {
            Self::drop_session(&mut st);
        }
    }

    pub(super) fn drop_session(st: &mut State) {
        st.tools = None;
        if let Some(mut s) = st.session.take() {
            tokio::spawn(async move {
                let _ = s.service.close_with_timeout(Duration::from_secs(10)).await;
            });
        }
    }

    /// Ends the current session, if any, and connects a new one.
    pub(super) async fn replace_session(&self, st: &mut State) -> Result<(), ToolError> {
        Self::drop_session(st);
        st.generation += 1;
        let session = self.connect(st.generation).await?;
        st.session = Some(session);
        Ok(())
    }

    pub(super) async fn connect(&self, generation: u64) -> Result<Session, ToolError> {
        let tools_changed = Arc::new(AtomicBool::new(false));
        let handler = Handler {
            config: ClientConfig::new(
                ClientCapabilities::default(),
                Implementation::new("agentd", env!("CARGO_PKG_VERSION")),
            ),
            tools_changed: tools_changed.clone(),
        };
        let secs = self.connect_timeout.as_secs_f64();
        let service = match &self.connection {
            Connection::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args).env_clear().kill_on_drop(true);
                for k in INHERITED_ENV {
                    if let Some(v) = std::env::var_os(k) {
                        cmd.env(k, v);
                    }
                }
                for (k, v) in env {
                    let v =
                        expand_env(v, &format!("the MCP server's env.{k}")).map_err(ToolError)?;
                    cmd.env(k, v);
                }
                if let Some(dir) = cwd {
                    cmd.current_dir(dir);
                }
                let (transport, stderr) = TokioChildProcess::builder(cmd)
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .map_err(|e| ToolError(format!("cannot start `{command}`: {e}")))?;
                let tail = Arc::new(StdMutex::new(VecDeque::new()));
                if let Some(stderr) = stderr {
                    tokio::spawn(forward_stderr(stderr, self.label.clone(), tail.clone()));
                }
                match tokio::time::timeout(self.connect_timeout, handler.serve(transport)).await {
                    Ok(Ok(service)) => service,
                    Ok(Err(e)) => {
                        // Give the stderr reader a moment to catch the server's last words.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        return Err(ToolError(format!(
                            "the MCP server `{command}` did not start: {}{}",
                            init_error(&e),
                            stderr_note(&tail)
                        )));
                    }
                    Err(_) => {
                        return Err(ToolError(format!(
                            "the MCP server `{command}` did not initialize within {secs} s{}",
                            stderr_note(&tail)
                        )))
                    }
                }
            }
            Connection::Http {
                url,
                headers,
                egress,
            } => {
                if let Ok(parsed) = reqwest::Url::parse(url) {
                    egress
                        .check_url(&parsed)
                        .map_err(|e| ToolError(format!("cannot connect to the MCP server: {e}")))?;
                }
                let client = http_client(egress)?;
                let mut map = HashMap::new();
                for (name, configured, template) in headers {
                    let field = format!("streamable_http_connection_params.headers.{configured}");
                    let value = expand_env(template, &field).map_err(ToolError)?;
                    let mut value = HeaderValue::from_str(&value)
                        .map_err(|_| ToolError(format!("{field} is not a valid header value")))?;
                    value.set_sensitive(true);
                    map.insert(name.clone(), value);
                }
                let config =
                    StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(map);
                let transport = StreamableHttpClientTransport::with_client(client, config);
                match tokio::time::timeout(self.connect_timeout, handler.serve(transport)).await {
                    Ok(Ok(service)) => service,
                    Ok(Err(e)) => {
                        return Err(ToolError(format!(
                            "cannot connect to the MCP server at {}: {}",
                            self.label.trim_start_matches("mcp:"),
                            init_error(&e)
                        )))
                    }
                    Err(_) => {
                        return Err(ToolError(format!(
                            "the MCP server at {} did not answer within {secs} s",
                            self.label.trim_start_matches("mcp:")
                        )))
                    }
                }
            }
        };
        tracing::info!(server = %self.label, "MCP server connected");
        Ok(Session {
            service,
            generation,
            tools_changed,
        })
    }
}

/// The HTTP client of a streamable HTTP connection (rmcp's reqwest 0.13); its resolver drops
/// addresses `egress` refuses. Its TLS is rustls with ring and the webpki roots, as agentd's other client:
/// preconfigured, because reqwest 0.13 would otherwise want a process-wide crypto provider and
/// the system's CA store (and panic inside rmcp without them). No redirects are followed (a
/// redirect could carry the session id and headers elsewhere); no idle connections are
/// pooled (rmcp's own default, against delayed-ACK stalls).
pub(super) fn http_client(egress: &EgressPolicy) -> Result<mcp_reqwest::Client, ToolError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ToolError(format!("cannot build the MCP HTTP client: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    mcp_reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(mcp_reqwest::redirect::Policy::none())
        // A proxy from the environment would resolve the target itself, around the rule.
        .no_proxy()
        .pool_max_idle_per_host(0)
        .connect_timeout(Duration::from_secs(10))
        .dns_resolver(Arc::new(McpResolver(egress.clone())))
        .user_agent(concat!("agentd/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ToolError(format!("cannot build the MCP HTTP client: {e}")))
}

/// Logs a stdio server's stderr and keeps its last lines for connection errors.
pub(super) async fn forward_stderr(
    stderr: tokio::process::ChildStderr,
    label: String,
    tail: Arc<StdMutex<VecDeque<String>>>,
) {
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::info!(target: "agentd::mcp", server = %label, "{line}");
        let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
        if t.len() == STDERR_TAIL_LINES {
            t.pop_front();
        }
        t.push_back(line.chars().take(300).collect());
    }
}

pub(super) fn stderr_note(tail: &StdMutex<VecDeque<String>>) -> String {
    let t = tail.lock().unwrap_or_else(|p| p.into_inner());
    if t.is_empty() {
        String::new()
    } else {
        let lines: Vec<&str> = t.iter().map(String::as_str).collect();
        format!(" (server stderr: {})", lines.join(" | "))
    }
}

/// An error and its causes, each once.
pub(super) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// What went wrong while initializing, without rmcp's transport type names.
pub(super) fn init_error(e: &ClientInitializeError) -> String {
    match e {
        ClientInitializeError::TransportError { error, context } => {
            format!("{} ({context})", error_chain(&*error.error))
        }
        other => other.to_string(),
    }
}

/// What went wrong with a request, without rmcp's transport type names.
pub(super) fn service_error(e: &ServiceError) -> String {
    match e {
        ServiceError::TransportSend(t) => error_chain(&*t.error),
        ServiceError::TransportClosed => "the connection is closed".into(),
        other => other.to_string(),
    }
}

pub(super) fn is_transport_error(e: &ServiceError) -> bool {
    matches!(
        e,
        ServiceError::TransportSend(_) | ServiceError::TransportClosed
    )
}
