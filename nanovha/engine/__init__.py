"""
The engine: what makes decode fast on a CPU, as a layer a reader of model.py can skip. The model
runs without it (eager, in float32); a command asks it for a plan in one call.

    plan.py      which runtime, dtype and attention kernel run a job fastest here, timed on the job itself
    compiled.py  the decode step compiled ahead of time (AOTInductor), cached per model and machine
    kernel.py    our one-token attention op (csrc/, C++), built for this CPU on first use
"""
