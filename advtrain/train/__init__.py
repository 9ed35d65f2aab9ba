"""Training: the runtime, `advtrain.fit`, callbacks, checkpoints and resume,
preemption, and the guards. Library layer: plain arguments, never imports
the application above it."""
