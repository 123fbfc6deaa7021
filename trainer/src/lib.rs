//! flamia-trainer: a Llama-3-style model on libtorch (tch) with attention through the FLAMIA
//! bridge, the training loop, checkpoints, configuration and metrics.
