//! The `layerwise` command: a thin shell over [`layerwise::cli`].

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(layerwise::cli::main_with_args(std::env::args_os()))
}
