"""The `layerwise` command installed by the Python package: the same command line as the Rust
binary, run by the extension."""

import sys


def main() -> None:
    from . import _native

    sys.exit(_native.main(["layerwise", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
