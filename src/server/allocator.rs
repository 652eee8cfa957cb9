//! glibc malloc settings for a server whose memory comes in bursts.
//!
//! A run's buffers (a request body, a long reply, its frames) are often tens or hundreds of
//! KiB. glibc serves those from its heaps and, once they are freed, keeps the pages: 201
//! clients reading a 256 KiB reply slowly left agentd at 216 MiB RSS, and it stayed at 216 MiB
//! after they hung up, though they held about 100 KiB each while reading (`agentd-bench
//! slow-readers`; docs/performance.md). With allocations of 64 KiB and more mapped on their
//! own (returned to the system when freed) and the heap trimmed above 64 KiB of free space,
//! the same run peaked at 40 MiB and went back to 39 MiB.
//!
//! Settings the operator gives glibc (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, or
//! `GLIBC_TUNABLES`) win: they are left alone.

/// Applies the settings (glibc on Linux; elsewhere nothing).
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let given = |name: &str| std::env::var_os(name).is_some();
        if given("GLIBC_TUNABLES") {
            return;
        }
        const THRESHOLD: libc::c_int = 64 * 1024;
        // SAFETY: mallopt only changes the allocator's global parameters (under its own lock);
        // it takes no pointers.
        unsafe {
            if !given("MALLOC_MMAP_THRESHOLD_") {
                libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD);
            }
            if !given("MALLOC_TRIM_THRESHOLD_") {
                libc::mallopt(libc::M_TRIM_THRESHOLD, THRESHOLD);
            }
        }
    }
}
