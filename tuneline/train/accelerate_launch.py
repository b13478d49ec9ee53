"""`accelerate launch` itself (its argument parser and launchers), then a quick exit once the training it
started has ended: the launcher's teardown of torch and accelerate took ~0.5 s after every run.

    python -m tuneline.train.accelerate_launch [accelerate launch options] -m tuneline.train CONFIG ...

A failed training raises here as it does in `accelerate launch` (its traceback, exit code 1).
"""

from accelerate.commands.launch import main

from tuneline.quick_exit import exit_quickly

if __name__ == "__main__":
    main()
    exit_quickly(0)
