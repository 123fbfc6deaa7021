# Sourced by the scripts: puts the project's toolchain environment in place.
# (The trainer issue adds the project-local PyTorch 2.11.0 virtualenv for libtorch here.)
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-auto}"
