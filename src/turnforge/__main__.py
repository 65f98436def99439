"""`python -m turnforge ...`, as `accelerate launch -m turnforge run RECIPE --out OUT` starts each process."""

from turnforge.cli import app

app(prog_name="turnforge")
