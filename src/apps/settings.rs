//! An app's server-side settings: `agentd.yaml` next to `root_agent.yaml`. They are agentd's
//! (webhooks today), so `root_agent.yaml` stays a file ADK itself can load.
//!
//! ```yaml
//! webhooks:
//!   - url: https://hooks.example.com/agentd
//!     secret: ${ORDERS_WEBHOOK_SECRET}
//!     events: [run.completed, run.failed]
//! ```

use super::yaml::expand_env;
use crate::webhook::AppWebhook;
use serde::Deserialize;
use std::path::Path;

pub const SETTINGS_FILE: &str = "agentd.yaml";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppSettings {
    /// Sent at the end of every run of the app.
    #[serde(default)]
    pub webhooks: Vec<AppWebhook>,
}

/// Reads `dir/agentd.yaml` (none: the defaults), with `${VAR}` expanded in secrets.
pub fn load_settings(dir: &Path) -> Result<AppSettings, String> {
    let file = dir.join(SETTINGS_FILE);
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(AppSettings::default()),
        Err(e) => return Err(format!("{}: cannot read: {e}", file.display())),
    };
    let mut settings: AppSettings =
        serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    for hook in &mut settings.webhooks {
        if let Some(secret) = &hook.secret {
            hook.secret = Some(expand_env(secret).map_err(|e| format!("{}: {e}", file.display()))?);
        }
    }
    Ok(settings)
}
