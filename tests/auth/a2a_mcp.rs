//! A2A and MCP behind the same door: bound to their user; public agent cards only when asked.

use super::*;
use crate::both_backends;

/// A2A and MCP behind the same door: an app's agent card needs a credential by default (only
/// `--a2a-public-cards` opens it) and says how to authenticate; every call needs a credential
/// that decides the user; another user's task is "not found"; a key limited to some apps sees
/// only those as MCP tools.
async fn a2a_and_mcp_are_bound_to_their_user(backend: Backend) {
    let s = with_keys(backend).await;
    let alice = key(&s.db, "alice", Some(&["echo"]), false, None).await;
    let bob = key(&s.db, "bob", None, false, None).await;

    // Cards are behind the door by default: a credential, and only the key's apps.
    let card_path = "/a2a/echo/.well-known/agent-card.json";
    let (st, _, _) = call(&s, Method::GET, card_path, None, Cred::Nothing).await;
    assert_eq!(st, 401);
    let (st, _, _) = call(
        &s,
        Method::GET,
        "/a2a/helpdesk/.well-known/agent-card.json",
        None,
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(
        st, 404,
        "a key limited to echo cannot read another app's card"
    );
    let (st, card, _) = call(&s, Method::GET, card_path, None, Cred::Bearer(&alice)).await;
    assert_eq!(st, 200, "{card}");
    assert_eq!(
        card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"],
        "Bearer"
    );
    assert!(card["securityRequirements"][0]["schemes"]["bearer"].is_object());

    let send = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message":
        {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "mine"}]}}});
    let (st, _, _) = call(&s, Method::POST, "/a2a/echo", Some(&send), Cred::Nothing).await;
    assert_eq!(st, 401, "A2A calls need a credential");
    let (st, sent, _) = call(
        &s,
        Method::POST,
        "/a2a/echo",
        Some(&send),
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(st, 200, "{sent}");
    let task = sent["result"]["task"]["id"]
        .as_str()
        .expect("task")
        .to_string();
    let ctx = sent["result"]["task"]["contextId"]
        .as_str()
        .expect("ctx")
        .to_string();
    // The context is alice's session.
    let (st, _, _) = call(
        &s,
        Method::GET,
        &format!("/apps/echo/users/alice/sessions/{ctx}"),
        None,
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(st, 200);
    let get = json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": task}});
    let (_, theirs, _) = call(
        &s,
        Method::POST,
        "/a2a/echo",
        Some(&get),
        Cred::Bearer(&bob),
    )
    .await;
    assert_eq!(theirs["error"]["code"], -32001, "{theirs}");
    // Bob naming alice's context gets his own session of that id, never hers.
    let into = json!({"jsonrpc": "2.0", "id": 3, "method": "SendMessage", "params": {"message":
        {"messageId": "m2", "role": "ROLE_USER", "parts": [{"text": "bob"}], "contextId": ctx}}});
    let (_, his, _) = call(
        &s,
        Method::POST,
        "/a2a/echo",
        Some(&into),
        Cred::Bearer(&bob),
    )
    .await;
    assert_eq!(
        his["result"]["task"]["history"].as_array().map(Vec::len),
        Some(2),
        "{his}"
    );
    let (_, hers, _) = call(
        &s,
        Method::POST,
        "/a2a/echo",
        Some(&get),
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(
        hers["result"]["history"].as_array().map(Vec::len),
        Some(2),
        "{hers}"
    );
    // An app outside alice's key is hidden, for A2A and MCP alike.
    let (st, _, _) = call(
        &s,
        Method::POST,
        "/a2a/helpdesk",
        Some(&send),
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(st, 404);

    let list = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {}});
    let mcp = |path: &'static str, cred: Option<String>| {
        let mut req = s
            .client
            .post(s.url(path))
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .json(&list);
        if let Some(k) = cred {
            req = req.bearer_auth(k);
        }
        req.send()
    };
    assert_eq!(mcp("/mcp", None).await.expect("POST").status(), 401);
    let tools: Value = mcp("/mcp", Some(alice.clone()))
        .await
        .expect("POST")
        .json()
        .await
        .expect("JSON");
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["echo"], "only the apps alice's key may use");
    let resp = mcp("/apps/helpdesk/mcp", Some(alice.clone()))
        .await
        .expect("POST");
    assert_eq!(resp.status(), 404);
    let bobs: Value = mcp("/mcp", Some(bob.clone()))
        .await
        .expect("POST")
        .json()
        .await
        .expect("JSON");
    assert!(bobs["result"]["tools"].as_array().expect("tools").len() > 1);
}

/// `--a2a-public-cards`: cards answer without credentials; nothing else does. A public card
/// takes its URLs from `--public-url` (required with it), never from the request's `Host`.
async fn public_agent_cards_need_no_credentials(backend: Backend) {
    let db = TestDb::new(backend).await;
    let mut args = agentd::config::ServeArgs::for_database(db.url.clone());
    args.interop.a2a_public_cards = true;
    let refused = agentd::server::Server::start(args)
        .await
        .err()
        .expect("refused");
    assert!(refused.to_string().contains("--public-url"), "{refused}");

    let s = TestServer::start_with(backend, |a| {
        a.security.auth = vec![AuthMode::ApiKey];
        a.interop.a2a_public_cards = true;
        a.interop.public_url = Some("https://agents.example.com/".into());
    })
    .await;
    let card = "/a2a/echo/.well-known/agent-card.json";
    let resp = s
        .client
        .get(s.url(card))
        .header("host", "evil.example")
        .send()
        .await
        .expect("GET");
    let body: Value = json_with_status(resp, 200).await;
    assert_eq!(body["name"], "echo");
    let card_text = body.to_string();
    assert!(!card_text.contains("evil.example"), "{card_text}");
    assert!(
        card_text.contains("https://agents.example.com/a2a/echo"),
        "{card_text}"
    );
    let (st, _, _) = call(&s, Method::GET, "/a2a/echo/tasks", None, Cred::Nothing).await;
    assert_eq!(st, 401);
}

both_backends!(
    a2a_and_mcp_are_bound_to_their_user,
    public_agent_cards_need_no_credentials,
);
