//! ADK's dev UI (`--web-ui-dir`), served at `/dev-ui/`: see `router`.
