//! sqlite-vec, compiled into agentd, on every SQLite connection: memory vectors are compared
//! with its `vec_distance_cosine` ([`super::memory_vectors`]), their sign bits with
//! [`super::hamming`]'s `agentd_hamming`.

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
        // SAFETY: SQLITE_CONFIG_MEMSTATUS takes one int, and may only be set before SQLite
        // is initialised (registering the extension below initialises it); later, it
        // returns SQLITE_MISUSE and changes nothing. Without it every allocation of every
        // connection takes one process-wide mutex, for statistics agentd never reads: two
        // searches on two connections (a hybrid search's halves) then queue on it.
        let memstatus =
            unsafe { libsqlite3_sys::sqlite3_config(libsqlite3_sys::SQLITE_CONFIG_MEMSTATUS, 0) };
        if memstatus != libsqlite3_sys::SQLITE_OK {
            tracing::debug!(
                rc = memstatus,
                "SQLite was initialised already: its allocation statistics stay on"
            );
        }
        // SAFETY: `sqlite3_vec_init` is sqlite-vec's extension entry point, which has exactly
        // the `Init` signature; the crate declares it without arguments. It is compiled
        // against the same SQLite (SQLITE_CORE), and registering an auto extension only
        // stores the pointer, which is 'static.
        let rc = unsafe {
            let init =
                std::mem::transmute::<*const (), Init>(sqlite_vec::sqlite3_vec_init as *const ());
            libsqlite3_sys::sqlite3_auto_extension(Some(init))
        };
        // SAFETY: `hamming::init` has exactly the entry point's signature; the pointer is
        // 'static.
        let rc_hamming =
            unsafe { libsqlite3_sys::sqlite3_auto_extension(Some(super::hamming::init)) };
        if rc_hamming != libsqlite3_sys::SQLITE_OK {
            tracing::error!(
                rc = rc_hamming,
                "could not register agentd_hamming; memory search is full-text only"
            );
        }
        if rc == libsqlite3_sys::SQLITE_OK && rc_hamming == libsqlite3_sys::SQLITE_OK {
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
