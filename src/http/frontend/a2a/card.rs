//! Agent cards: what an app says of itself to other agents (`GET
//! /a2a/{app}/.well-known/agent-card.json`), built from its agent tree and the optional
//! `a2a:` block of its `agentd.yaml`.

use super::Interop;
use crate::agent::AgentTree;
use crate::apps::settings::A2aCard;
use crate::config::AuthMode;
use a2a_types as a2a;
use axum::http::HeaderMap;
use std::collections::HashMap;

/// The A2A protocol version agentd speaks (it also answers 0.3's method names).
pub const PROTOCOL_VERSION: &str = "1.0";

/// The base URL clients reach this server at: `--public-url`, else the request's `Host`
/// (with `X-Forwarded-Proto`, as a proxy in front sets it).
pub fn base_url(interop: &Interop, headers: &HeaderMap) -> String {
    if let Some(url) = &interop.public_url {
        return url.trim_end_matches('/').to_string();
    }
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_graphic()))
        .unwrap_or("localhost");
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .filter(|p| *p == "https" || *p == "http")
        .unwrap_or("http");
    format!("{scheme}://{host}")
}

/// The skills a tree offers: the card's own when the YAML names them, else one per
/// sub-agent of the root (what a transfer can reach) and one per tool of the root, else
/// the root itself.
fn skills(tree: &AgentTree, card: Option<&A2aCard>) -> Vec<a2a::AgentSkill> {
    if let Some(skills) = card.map(|c| &c.skills).filter(|s| !s.is_empty()) {
        return skills
            .iter()
            .map(|s| a2a::AgentSkill {
                id: s.id.clone(),
                name: s.name.clone().unwrap_or_else(|| s.id.clone()),
                description: s.description.clone().unwrap_or_default(),
                tags: s.tags.clone(),
                examples: s.examples.clone(),
                input_modes: vec![],
                output_modes: vec![],
                security_requirements: vec![],
            })
            .collect();
    }
    let root = tree.root();
    let skill = |id: &str, description: &str, tag: &str| a2a::AgentSkill {
        id: id.to_string(),
        name: id.to_string(),
        description: description.to_string(),
        tags: vec![tag.to_string()],
        examples: vec![],
        input_modes: vec![],
        output_modes: vec![],
        security_requirements: vec![],
    };
    let mut out: Vec<a2a::AgentSkill> = root
        .sub_agents()
        .iter()
        .map(|a| skill(a.name(), a.description(), "agent"))
        .collect();
    out.extend(
        root.tool_declarations()
            .iter()
            .filter(|t| t.name != crate::tools::builtin::TRANSFER_TO_AGENT)
            .map(|t| skill(&t.name, &t.description, "tool")),
    );
    if out.is_empty() {
        out.push(skill(root.name(), root.description(), "agent"));
    }
    out
}

/// The security schemes matching `--auth`: every key and token is a bearer credential.
fn security(
    modes: &[AuthMode],
) -> (
    HashMap<String, a2a::SecurityScheme>,
    Vec<a2a::SecurityRequirement>,
) {
    let formats: Vec<&str> = modes
        .iter()
        .filter_map(|m| match m {
            AuthMode::ApiKey => Some("API key"),
            AuthMode::Jwt => Some("JWT"),
            AuthMode::None => None,
        })
        .collect();
    if formats.is_empty() {
        return (HashMap::new(), vec![]);
    }
    let scheme = a2a::SecurityScheme {
        scheme: Some(a2a::security_scheme::Scheme::HttpAuthSecurityScheme(
            a2a::HttpAuthSecurityScheme {
                description: "An agentd API key or a JWT from the configured issuer, as \
                              `Authorization: Bearer …`."
                    .into(),
                scheme: "Bearer".into(),
                bearer_format: formats.join(" or "),
            },
        )),
    };
    let requirement = a2a::SecurityRequirement {
        schemes: HashMap::from([("bearer".to_string(), a2a::StringList { list: vec![] })]),
    };
    (
        HashMap::from([("bearer".to_string(), scheme)]),
        vec![requirement],
    )
}

/// The card of app `app`.
pub fn agent_card(
    interop: &Interop,
    headers: &HeaderMap,
    app: &str,
    tree: &AgentTree,
    card: Option<&A2aCard>,
) -> a2a::AgentCard {
    let url = format!("{}/a2a/{app}", base_url(interop, headers));
    let interface = |binding: &str| a2a::AgentInterface {
        url: url.clone(),
        protocol_binding: binding.to_string(),
        tenant: String::new(),
        protocol_version: PROTOCOL_VERSION.to_string(),
    };
    let (security_schemes, security_requirements) = security(&interop.auth);
    let root = tree.root();
    a2a::AgentCard {
        name: card
            .and_then(|c| c.name.clone())
            .unwrap_or_else(|| app.to_string()),
        description: card
            .and_then(|c| c.description.clone())
            .unwrap_or_else(|| root.description().to_string()),
        supported_interfaces: vec![interface("JSONRPC"), interface("HTTP+JSON")],
        provider: None,
        version: card
            .and_then(|c| c.version.clone())
            .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string()),
        documentation_url: card.and_then(|c| c.documentation_url.clone()),
        capabilities: Some(a2a::AgentCapabilities {
            streaming: Some(true),
            push_notifications: Some(true),
            extensions: vec![],
            extended_agent_card: Some(false),
        }),
        security_schemes,
        security_requirements,
        default_input_modes: vec!["text/plain".into(), "application/json".into()],
        default_output_modes: vec!["text/plain".into(), "application/json".into()],
        skills: skills(tree, card),
        signatures: vec![],
        icon_url: None,
    }
}
