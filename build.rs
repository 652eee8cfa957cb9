// The SQL migrations are embedded at compile time (`sqlx::migrate!`); rebuild when one is
// added or changed, even if no Rust file changed.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
