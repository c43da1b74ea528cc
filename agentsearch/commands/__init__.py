"""The commands: one module per command of `agentsearch`, each opens the workspace, calls the layers below and
prints; `cli` only parses and dispatches to them."""
