//! `agentd_hamming(a, b)`: the number of bits in which two blobs differ, as an SQL function on
//! every SQLite connection. The search by meaning ranks a user's sign bits with it
//! ([`super::memory_vectors`]): sqlite-vec's `vec_distance_hamming(vec_bit(a), vec_bit(b))`
//! gives the same number, but copies and checks both blobs on every row (a user with 100,000
//! memories calls it 100,000 times per search); this reads them in place.
//!
//! Blobs of different lengths, or anything but two blobs, give NULL.

use libsqlite3_sys as ffi;
use std::os::raw::{c_char, c_int};

/// The function's body: SQLite calls it with exactly two arguments (its registered arity).
unsafe extern "C" fn hamming(
    ctx: *mut ffi::sqlite3_context,
    argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: SQLite passes `argc` valid values; a blob's pointer and length stay valid
    // until the value is next converted or the call returns, and neither value is touched
    // again before the slices are dropped.
    unsafe {
        if argc != 2 || argv.is_null() {
            ffi::sqlite3_result_null(ctx);
            return;
        }
        let (a, b) = (*argv, *argv.add(1));
        if ffi::sqlite3_value_type(a) != ffi::SQLITE_BLOB
            || ffi::sqlite3_value_type(b) != ffi::SQLITE_BLOB
        {
            ffi::sqlite3_result_null(ctx);
            return;
        }
        let (pa, na) = (ffi::sqlite3_value_blob(a), ffi::sqlite3_value_bytes(a));
        let (pb, nb) = (ffi::sqlite3_value_blob(b), ffi::sqlite3_value_bytes(b));
        if na != nb || na <= 0 || pa.is_null() || pb.is_null() {
            ffi::sqlite3_result_null(ctx);
            return;
        }
        let a = std::slice::from_raw_parts(pa as *const u8, na as usize);
        let b = std::slice::from_raw_parts(pb as *const u8, nb as usize);
        ffi::sqlite3_result_int64(ctx, distance(a, b) as i64);
    }
}

/// Bits in which `a` and `b` (of one length) differ.
fn distance(a: &[u8], b: &[u8]) -> u32 {
    let (mut n, mut ca, mut cb) = (0, a.chunks_exact(8), b.chunks_exact(8));
    for (x, y) in (&mut ca).zip(&mut cb) {
        let x = u64::from_ne_bytes(x.try_into().unwrap_or_default());
        let y = u64::from_ne_bytes(y.try_into().unwrap_or_default());
        n += (x ^ y).count_ones();
    }
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        n += (x ^ y).count_ones();
    }
    n
}

/// Registers the function on a new connection (an SQLite auto extension's entry point).
pub(super) unsafe extern "C" fn init(
    db: *mut ffi::sqlite3,
    _err: *mut *mut c_char,
    _api: *const ffi::sqlite3_api_routines,
) -> c_int {
    // SAFETY: `db` is the connection being opened; the name is a NUL-terminated 'static
    // string, and the function needs no user data nor destructor.
    unsafe {
        ffi::sqlite3_create_function_v2(
            db,
            c"agentd_hamming".as_ptr(),
            2,
            ffi::SQLITE_UTF8 | ffi::SQLITE_DETERMINISTIC | ffi::SQLITE_INNOCUOUS,
            std::ptr::null_mut(),
            Some(hamming),
            None,
            None,
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::distance;

    #[test]
    fn counts_the_bits_that_differ() {
        assert_eq!(distance(&[0; 48], &[0; 48]), 0);
        assert_eq!(distance(&[0xff; 48], &[0; 48]), 384);
        let mut a = [0u8; 13];
        a[0] = 0b1010;
        a[12] = 0b1;
        assert_eq!(distance(&a, &[0; 13]), 3);
    }
}
