//! Child processes layerwise starts (the load check, a data loader's Python) end with it: an
//! interrupted `fix` left its `check-load` child running, with its scratch folder, after the
//! parent had exited. On Linux the kernel sends the child
//! SIGTERM when layerwise ends, which the child's own handler turns into a clean exit (its
//! temporary files removed).

use std::process::Command;

/// Makes `command`'s process receive SIGTERM when this process ends (Linux; elsewhere nothing).
pub fn ends_with_this_process(command: &mut Command) -> &mut Command {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the child between fork and exec and only calls prctl, which
        // is async-signal-safe and touches no memory of the parent's.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    command
}
