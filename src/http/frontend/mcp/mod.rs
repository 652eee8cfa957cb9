//! agentd as an MCP server (streamable HTTP): every app the caller may use is a tool of
//! `/mcp`, and `/apps/{app}/mcp` serves one app. Built on `rmcp`'s server side, stateless,
//! so any replica serves any request and no sticky sessions are needed
//! ([`routes`] wires it into the router, [`tools`] is the handler, [`map`] the pure part,
//! [`doc`] its place in the OpenAPI document).
//! See `docs/mcp.md`.

pub mod doc;
pub mod map;
pub mod routes;
pub mod tools;

pub use doc::McpDoc;
pub use routes::router;
