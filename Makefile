# The README's two commands: `make demo` and `make test`. Both set everything up first.
.PHONY: setup demo test test-unit clean

setup:
	deploy/setup.sh

demo: setup
	.venv/bin/delayq demo

test: setup
	.venv/bin/python -m pytest

test-unit: setup
	.venv/bin/python -m pytest tests/unit

clean:
	-.venv/bin/delayq kafka stop
	rm -rf data
