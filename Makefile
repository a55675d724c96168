.PHONY: venv tune test lint

venv:
	scripts/venv

# The main job: tune the bundled reference server on this machine.
tune: venv
	.venv/bin/batchpilot tune --local

# The whole test suite (unit, component, operator, runtimes, e2e; scripts/test).
test:
	scripts/test

# Style, types, and the package's layers (docs/architecture.md, "Layers").
lint: venv
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy \
		&& .venv/bin/lint-imports --no-cache --no-logo
