//! A2A 0.3 clients over the JSON-RPC binding: their method names (`message/send`,
//! `tasks/get`, …) are answered, their requests rewritten to 1.0's JSON and the answers
//! back to 0.3's (`kind` discriminators, lower-case states and roles, `final` on the last
//! status update, file parts). Pure JSON rewriting; the work is 1.0's.

use serde_json::{json, Map, Value};

/// The 1.0 method a 0.3 method name is.
pub fn method(name: &str) -> Option<&'static str> {
    Some(match name {
        "message/send" => "SendMessage",
        "message/stream" => "SendStreamingMessage",
        "tasks/get" => "GetTask",
        "tasks/list" => "ListTasks",
        "tasks/cancel" => "CancelTask",
        "tasks/resubscribe" => "SubscribeToTask",
        "tasks/pushNotificationConfig/set" => "CreateTaskPushNotificationConfig",
        "tasks/pushNotificationConfig/get" => "GetTaskPushNotificationConfig",
        "tasks/pushNotificationConfig/list" => "ListTaskPushNotificationConfigs",
        "tasks/pushNotificationConfig/delete" => "DeleteTaskPushNotificationConfig",
        "agent/getAuthenticatedExtendedCard" => "GetExtendedAgentCard",
        _ => return None,
    })
}

fn part_in(p: &Value) -> Value {
    let Some(o) = p.as_object() else {
        return p.clone();
    };
    let mut out = Map::new();
    if let Some(m) = o.get("metadata") {
        out.insert("metadata".into(), m.clone());
    }
    match o.get("kind").and_then(Value::as_str) {
        Some("text") => {
            out.insert("text".into(), o.get("text").cloned().unwrap_or(json!("")));
        }
        Some("data") => {
            out.insert("data".into(), o.get("data").cloned().unwrap_or(json!({})));
        }
        Some("file") => {
            let file = o
                .get("file")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            if let Some(b) = file.get("bytes") {
                out.insert("raw".into(), b.clone());
            } else if let Some(u) = file.get("uri") {
                out.insert("url".into(), u.clone());
            }
            if let Some(m) = file.get("mimeType") {
                out.insert("mediaType".into(), m.clone());
            }
            if let Some(n) = file.get("name") {
                out.insert("filename".into(), n.clone());
            }
        }
        // Not a 0.3 part: left as it is, for 1.0's parser to judge.
        _ => return p.clone(),
    }
    Value::Object(out)
}

fn message_in(m: &Value) -> Value {
    let Some(o) = m.as_object() else {
        return m.clone();
    };
    let mut out = o.clone();
    out.remove("kind");
    if let Some(role) = o.get("role").and_then(Value::as_str) {
        let r = match role {
            "user" => "ROLE_USER",
            "agent" => "ROLE_AGENT",
            other => other,
        };
        out.insert("role".into(), json!(r));
    }
    if let Some(Value::Array(parts)) = o.get("parts") {
        out.insert(
            "parts".into(),
            Value::Array(parts.iter().map(part_in).collect()),
        );
    }
    Value::Object(out)
}

/// A 0.3 `PushNotificationConfig` (`{id?, url, token?, authentication?: {schemes,
/// credentials?}}`) of task `task_id` as 1.0's `TaskPushNotificationConfig`.
fn push_in(task_id: Option<&Value>, config: &Value) -> Value {
    let mut out = Map::new();
    if let Some(t) = task_id {
        out.insert("taskId".into(), t.clone());
    }
    for key in ["id", "url", "token"] {
        if let Some(v) = config.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    if let Some(auth) = config.get("authentication") {
        let mut a = Map::new();
        if let Some(scheme) = auth["schemes"].as_array().and_then(|s| s.first()) {
            a.insert("scheme".into(), scheme.clone());
        }
        if let Some(c) = auth.get("credentials") {
            a.insert("credentials".into(), c.clone());
        }
        out.insert("authentication".into(), Value::Object(a));
    }
    Value::Object(out)
}

/// 1.0's `TaskPushNotificationConfig` as 0.3's `{taskId, pushNotificationConfig}`.
fn push_out(v: &Value) -> Value {
    let mut config = Map::new();
    for key in ["id", "url", "token"] {
        if let Some(x) = v.get(key) {
            config.insert(key.into(), x.clone());
        }
    }
    if let Some(scheme) = v["authentication"]["scheme"].as_str() {
        config.insert("authentication".into(), json!({"schemes": [scheme]}));
    }
    json!({"taskId": v.get("taskId").cloned().unwrap_or(Value::Null),
           "pushNotificationConfig": config})
}

/// A 0.3 request's params as 1.0's.
pub fn params_in(method: &str, params: Value) -> Value {
    let Value::Object(mut o) = params else {
        return params;
    };
    match method {
        "SendMessage" | "SendStreamingMessage" => {
            if let Some(m) = o.get("message") {
                let m = message_in(m);
                o.insert("message".into(), m);
            }
            if let Some(Value::Object(c)) = o.get_mut("configuration") {
                if let Some(blocking) = c.remove("blocking") {
                    c.insert(
                        "returnImmediately".into(),
                        json!(blocking == Value::Bool(false)),
                    );
                }
                // The whole config: its token and credentials too.
                if let Some(push) = c.remove("pushNotificationConfig") {
                    c.insert("taskPushNotificationConfig".into(), push_in(None, &push));
                }
            }
        }
        "GetTask" | "SubscribeToTask" => {
            o.remove("metadata");
        }
        "CreateTaskPushNotificationConfig" => {
            let config = o
                .get("pushNotificationConfig")
                .cloned()
                .unwrap_or(json!({}));
            return push_in(o.get("taskId"), &config);
        }
        // 0.3 names the task `id` and the config `pushNotificationConfigId`.
        "GetTaskPushNotificationConfig"
        | "DeleteTaskPushNotificationConfig"
        | "ListTaskPushNotificationConfigs" => {
            let mut out = Map::new();
            if let Some(t) = o.get("id") {
                out.insert("taskId".into(), t.clone());
            }
            if let Some(c) = o.get("pushNotificationConfigId") {
                out.insert("id".into(), c.clone());
            }
            return Value::Object(out);
        }
        _ => {}
    }
    Value::Object(o)
}

fn state_out(s: &str) -> String {
    s.strip_prefix("TASK_STATE_")
        .unwrap_or(s)
        .to_ascii_lowercase()
        .replace('_', "-")
}

fn part_out(p: &Value) -> Value {
    let Some(o) = p.as_object() else {
        return p.clone();
    };
    let mut out = Map::new();
    if let Some(t) = o.get("text") {
        out.insert("kind".into(), json!("text"));
        out.insert("text".into(), t.clone());
    } else if let Some(d) = o.get("data") {
        out.insert("kind".into(), json!("data"));
        out.insert("data".into(), d.clone());
    } else {
        let mut file = Map::new();
        if let Some(b) = o.get("raw") {
            file.insert("bytes".into(), b.clone());
        }
        if let Some(u) = o.get("url") {
            file.insert("uri".into(), u.clone());
        }
        if let Some(m) = o.get("mediaType") {
            file.insert("mimeType".into(), m.clone());
        }
        if let Some(n) = o.get("filename") {
            file.insert("name".into(), n.clone());
        }
        out.insert("kind".into(), json!("file"));
        out.insert("file".into(), Value::Object(file));
    }
    if let Some(m) = o.get("metadata") {
        out.insert("metadata".into(), m.clone());
    }
    Value::Object(out)
}

fn parts_out(o: &mut Map<String, Value>) {
    if let Some(Value::Array(parts)) = o.get("parts") {
        let parts = parts.iter().map(part_out).collect();
        o.insert("parts".into(), Value::Array(parts));
    }
}

fn message_out(m: &Value) -> Value {
    let Some(o) = m.as_object() else {
        return m.clone();
    };
    let mut o = o.clone();
    o.insert("kind".into(), json!("message"));
    let role = match o.get("role").and_then(Value::as_str) {
        Some("ROLE_USER") => "user",
        _ => "agent",
    };
    o.insert("role".into(), json!(role));
    parts_out(&mut o);
    Value::Object(o)
}

fn status_out(s: &Value) -> Value {
    let Some(o) = s.as_object() else {
        return s.clone();
    };
    let mut o = o.clone();
    let state = o
        .get("state")
        .and_then(Value::as_str)
        .map(state_out)
        .unwrap_or_else(|| "unknown".into());
    o.insert("state".into(), json!(state));
    if let Some(m) = o.get("message") {
        let m = message_out(m);
        o.insert("message".into(), m);
    }
    Value::Object(o)
}

fn artifact_out(a: &Value) -> Value {
    let Some(o) = a.as_object() else {
        return a.clone();
    };
    let mut o = o.clone();
    parts_out(&mut o);
    Value::Object(o)
}

fn task_out(t: &Value) -> Value {
    let Some(o) = t.as_object() else {
        return t.clone();
    };
    let mut o = o.clone();
    o.insert("kind".into(), json!("task"));
    if let Some(s) = o.get("status") {
        let s = status_out(s);
        o.insert("status".into(), s);
    }
    for (key, f) in [
        ("history", message_out as fn(&Value) -> Value),
        ("artifacts", artifact_out),
    ] {
        if let Some(Value::Array(items)) = o.get(key) {
            let items = items.iter().map(f).collect();
            o.insert(key.into(), Value::Array(items));
        }
    }
    Value::Object(o)
}

/// A 1.0 result as 0.3's: a `SendMessageResponse` or `StreamResponse` is its payload with
/// a `kind`; a task, a list of tasks and anything else are rewritten in place.
pub fn result_out(method: &str, v: Value) -> Value {
    let Value::Object(o) = &v else {
        return v;
    };
    if let Some(t) = o.get("task") {
        return task_out(t);
    }
    if let Some(m) = o.get("message") {
        return message_out(m);
    }
    if let Some(u) = o.get("statusUpdate").and_then(Value::as_object) {
        let mut u = u.clone();
        u.insert("kind".into(), json!("status-update"));
        let status = u.get("status").map(status_out).unwrap_or(Value::Null);
        let state = status["state"].as_str().unwrap_or("");
        let last = matches!(
            state,
            "completed" | "failed" | "canceled" | "rejected" | "input-required" | "auth-required"
        );
        u.insert("status".into(), status);
        u.insert("final".into(), json!(last));
        return Value::Object(u);
    }
    if let Some(a) = o.get("artifactUpdate").and_then(Value::as_object) {
        let mut a = a.clone();
        a.insert("kind".into(), json!("artifact-update"));
        if let Some(art) = a.get("artifact") {
            let art = artifact_out(art);
            a.insert("artifact".into(), art);
        }
        return Value::Object(a);
    }
    match method {
        "CreateTaskPushNotificationConfig" | "GetTaskPushNotificationConfig" => {
            return push_out(&v)
        }
        "ListTaskPushNotificationConfigs" => {
            return Value::Array(
                o.get("configs")
                    .and_then(Value::as_array)
                    .map(|c| c.iter().map(push_out).collect())
                    .unwrap_or_default(),
            )
        }
        "DeleteTaskPushNotificationConfig" => return Value::Null,
        _ => {}
    }
    if method == "ListTasks" {
        let mut o = o.clone();
        if let Some(Value::Array(tasks)) = o.get("tasks") {
            let tasks = tasks.iter().map(task_out).collect();
            o.insert("tasks".into(), Value::Array(tasks));
        }
        return Value::Object(o);
    }
    if o.contains_key("status") && o.contains_key("id") {
        return task_out(&v);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_03_message_becomes_10_and_the_answers_go_back() {
        let p = params_in(
            "SendMessage",
            json!({"message": {"kind": "message", "messageId": "m1", "role": "user",
                "parts": [{"kind": "text", "text": "hi"},
                          {"kind": "file", "file": {"uri": "https://x/a.pdf", "mimeType": "application/pdf"}}]},
                   "configuration": {"blocking": false}}),
        );
        assert_eq!(
            p,
            json!({"message": {"messageId": "m1", "role": "ROLE_USER",
                "parts": [{"text": "hi"}, {"url": "https://x/a.pdf", "mediaType": "application/pdf"}]},
                   "configuration": {"returnImmediately": true}})
        );
        let task = result_out(
            "SendMessage",
            json!({"task": {"id": "t", "contextId": "c",
                "status": {"state": "TASK_STATE_INPUT_REQUIRED"},
                "history": [{"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}]}}),
        );
        assert_eq!(task["kind"], "task");
        assert_eq!(task["status"]["state"], "input-required");
        assert_eq!(task["history"][0]["role"], "user");
        assert_eq!(
            task["history"][0]["parts"][0],
            json!({"kind": "text", "text": "hi"})
        );
        let end = result_out(
            "SendStreamingMessage",
            json!({"statusUpdate": {"taskId": "t", "contextId": "c",
                "status": {"state": "TASK_STATE_COMPLETED"}}}),
        );
        assert_eq!(end["kind"], "status-update");
        assert_eq!(end["final"], true);
        assert_eq!(method("tasks/resubscribe"), Some("SubscribeToTask"));
        let set = params_in(
            "CreateTaskPushNotificationConfig",
            json!({"taskId": "t", "pushNotificationConfig": {"url": "https://h/x", "token": "tok",
                "authentication": {"schemes": ["Bearer"], "credentials": "c"}}}),
        );
        assert_eq!(
            set,
            json!({"taskId": "t", "url": "https://h/x", "token": "tok",
                   "authentication": {"scheme": "Bearer", "credentials": "c"}})
        );
        assert_eq!(
            params_in(
                "GetTaskPushNotificationConfig",
                json!({"id": "t", "pushNotificationConfigId": "c1"})
            ),
            json!({"taskId": "t", "id": "c1"})
        );
        let got = result_out(
            "GetTaskPushNotificationConfig",
            json!({"id": "c1", "taskId": "t", "url": "https://h/x", "authentication": {"scheme": "Bearer"}}),
        );
        assert_eq!(
            got["pushNotificationConfig"]["authentication"]["schemes"],
            json!(["Bearer"])
        );
        assert_eq!(method("tasks/unknown"), None);
    }
}
