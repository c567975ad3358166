"""Neural network layers."""
