"""pyinfra roles: one @deploy per concern. A role lays down what pdkit.render.plan decided; it never re-derives a value."""
