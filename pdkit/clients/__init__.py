"""The control machine's clients of the running services, standard library only: the router's worker
API and the graded answer gate (with its sgl-eval runner)."""
