//! The `layerwise` command: a thin shell over [`layerwise::cli`].

fn main() -> std::process::ExitCode {
    // The load check runs this very executable, whatever its file is named: a file called
    // `layerwise` beside a renamed copy is not ours to run (found by an independent tester).
    if let Ok(exe) = std::env::current_exe() {
        layerwise::load_check::set_self_command(vec![exe.into_os_string()]);
    }
    std::process::ExitCode::from(layerwise::cli::main_with_args(std::env::args_os()))
}
