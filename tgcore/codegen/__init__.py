"""Code generation: a kernel's AST to the UOp IR."""
