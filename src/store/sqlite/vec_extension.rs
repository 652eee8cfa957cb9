//! sqlite-vec, compiled into agentd, on every SQLite connection: memory vectors are compared
//! with its `vec_distance_cosine` ([`super::memory_vectors`]).

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether [`register`] succeeded.
static REGISTERED: AtomicBool = AtomicBool::new(false);

/// Registers sqlite-vec with the SQLite sqlx bundles, for every connection opened from now
/// on. Idempotent.
pub(super) fn register() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        type Init = unsafe extern "C" fn(
            *mut libsqlite3_sys::sqlite3,
            *mut *mut std::os::raw::c_char,
            *const libsqlite3_sys::sqlite3_api_routines,
        ) -> std::os::raw::c_int;
        // SAFETY: `sqlite3_vec_init` is sqlite-vec's extension entry point, which has exactly
        // the `Init` signature; the crate declares it without arguments. It is compiled
        // against the same SQLite (SQLITE_CORE), and registering an auto extension only
        // stores the pointer, which is 'static.
        let rc = unsafe {
            let init =
                std::mem::transmute::<*const (), Init>(sqlite_vec::sqlite3_vec_init as *const ());
            libsqlite3_sys::sqlite3_auto_extension(Some(init))
        };
        if rc == libsqlite3_sys::SQLITE_OK {
            REGISTERED.store(true, Ordering::Relaxed);
        } else {
            tracing::error!(
                rc,
                "could not register sqlite-vec; memory search is full-text only"
            );
        }
    });
}

/// Whether sqlite-vec is on every connection.
pub(super) fn registered() -> bool {
    REGISTERED.load(Ordering::Relaxed)
}
