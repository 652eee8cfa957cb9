//! The Vercel AI SDK: the routes ([`routes`]) and the pure mapping from run items and stored events
//! to the protocol's frames ([`map`]).

pub mod map;
pub mod routes;

pub use routes::router;
