//! Function tools: a Rust async closure plus a name and description. With
//! [`FunctionTool::new`] the argument type derives the JSON schema the model sees
//! (`schemars`) and the arguments are deserialized into it; a model that sends wrong
//! arguments gets the field path and reason back as the tool's error.

use super::{Tool, ToolContext, ToolError, ToolResult};
use crate::event::JsonMap;
use async_trait::async_trait;
use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;

type Handler = Arc<dyn Fn(JsonMap, ToolContext) -> BoxFuture<'static, ToolResult> + Send + Sync>;

pub struct FunctionTool {
    name: String,
    description: String,
    parameters: Option<Value>,
    long_running: bool,
    require_confirmation: bool,
    idempotent: bool,
    handler: Handler,
}

impl FunctionTool {
    /// A tool whose arguments deserialize into `A`; the schema comes from `A`.
    pub fn new<A, F, Fut>(name: impl Into<String>, description: impl Into<String>, f: F) -> Self
    where
        A: DeserializeOwned + schemars::JsonSchema + Send + 'static,
        F: Fn(A, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ToolResult> + Send + 'static,
    {
        let f = Arc::new(f);
        let handler: Handler = Arc::new(move |args: JsonMap, ctx: ToolContext| {
            let f = f.clone();
            Box::pin(async move {
                let parsed: A =
                    serde_path_to_error::deserialize(Value::Object(args)).map_err(|e| {
                        let path = e.path().to_string();
                        let path = if path == "." {
                            String::new()
                        } else {
                            format!(" at `{path}`")
                        };
                        ToolError(format!("invalid arguments{path}: {}", e.inner()))
                    })?;
                f(parsed, ctx).await
            })
        });
        FunctionTool {
            name: name.into(),
            description: description.into(),
            parameters: Some(schema_of::<A>()),
            long_running: false,
            require_confirmation: false,
            idempotent: false,
            handler,
        }
    }

    /// A tool over raw JSON arguments with an explicit schema.
    pub fn raw<F, Fut>(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Option<Value>,
        f: F,
    ) -> Self
    where
        F: Fn(JsonMap, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ToolResult> + Send + 'static,
    {
        FunctionTool {
            name: name.into(),
            description: description.into(),
            parameters,
            long_running: false,
            require_confirmation: false,
            idempotent: false,
            handler: Arc::new(move |a, c| Box::pin(f(a, c))),
        }
    }

    /// Marks the tool long-running: returning `Value::Null` leaves the call pending.
    pub fn long_running(mut self) -> Self {
        self.long_running = true;
        self
    }

    /// Calls need the client's approval first.
    pub fn require_confirmation(mut self) -> Self {
        self.require_confirmation = true;
        self
    }

    /// A call may be made again without harm: one in flight when its replica stopped is run
    /// again where the run goes on (see [`Tool::is_idempotent`]).
    pub fn idempotent(mut self) -> Self {
        self.idempotent = true;
        self
    }
}

/// The JSON schema of `A`, without the meta keys models do not need.
pub fn schema_of<A: schemars::JsonSchema>() -> Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(A)).unwrap_or(Value::Null);
    if let Some(obj) = schema.as_object_mut() {
        obj.remove("$schema");
        obj.remove("title");
    }
    schema
}

#[async_trait]
impl Tool for FunctionTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Option<Value> {
        self.parameters.clone()
    }

    fn is_long_running(&self) -> bool {
        self.long_running
    }

    fn requires_confirmation(&self) -> bool {
        self.require_confirmation
    }

    fn is_idempotent(&self) -> bool {
        self.idempotent
    }

    async fn call(&self, args: JsonMap, ctx: &ToolContext) -> ToolResult {
        (self.handler)(args, ctx.clone()).await
    }
}
