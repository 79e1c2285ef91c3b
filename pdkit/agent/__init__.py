"""What runs ON a node, in the node venv (pdkit.wheels.wheelhouse.NODE_SOURCES): health and ready gates,
releases and rollbacks, the change rule, engine shape and start history, JIT caches, page-cache
residency, pdkit-exporter. Imports only the standard library, the node lock and pdkit.upstream."""
