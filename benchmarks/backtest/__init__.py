"""Back-test of the simulator's cost model against published end-to-end XDNA2 figures.

figures.py: the published figures as data (with who/hardware/software/source);
layouts.py: for each figure, the launches that system is known (or assumed) to run, priced by
the cost model; report.py: published vs modeled, ratio, dominant terms. Every modeled figure
is the simulator's cost model, never a measurement.
"""
