//! The OpenAI Chat Completions and Responses APIs: the routes ([`routes`]: what both share,
//! [`chat`], [`responses`]) and the pure mapping from run items and stored events to the
//! protocol's frames ([`map`]).

mod chat;
mod conversation;
pub mod map;
mod responses;
pub mod routes;

pub use routes::router;
