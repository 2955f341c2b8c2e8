//! The `layerwise` command: a thin shell over [`layerwise::cli`].

fn main() -> std::process::ExitCode {
    // The load check runs this very executable, whatever its file is named: a file called
    // `layerwise` beside a renamed copy is not ours to run.
    // On Linux, /proc/self/exe is the running image itself, even where the file was replaced or
    // deleted since it started (an upgrade during a long `fix`).
    let running = std::path::Path::new("/proc/self/exe");
    let exe = if running.exists() { Some(running.to_path_buf()) } else { std::env::current_exe().ok() };
    if let Some(exe) = exe {
        layerwise::load_check::set_self_command(vec![exe.into_os_string()]);
    }
    std::process::ExitCode::from(layerwise::cli::main_with_args(std::env::args_os()))
}
