"""The command line's commands, one module per command; each defines ``main(argv=None) -> int``.

captioner/cli.py maps command names to these modules (``captioner <command>``, ``python -m captioner
<command>``) and imports only the one asked for. A command parses its arguments, calls the library
(``train.train``, ``evaluate.evaluate_model``, ``api.load_captioner``, ...), prints, and turns the errors
it expects into an exit status; nothing below imports a command, and library modules hold no ``main``
(tests/test_layering.py).

    train     train a captioner from a config                       captioner/training/loop.py
    caption   caption image files, globs or directories             captioner/api.py
    evaluate  decode a split and score it                           captioner/evaluation/split.py
    score     score a COCO-format results file                      captioner/evaluation/score.py
    extract   precompute encoder grids into the feature cache       captioner/data/features.py
    demo      the end-to-end run on the built-in shapes data        captioner/demo.py, training/loop.py, evaluation/
    export    write a run as a Hub-style model folder               captioner/api.py, captioner/store/hub.py
    config    list the shipped configs, or show one resolved        captioner/config.py
    shapes    write the built-in synthetic shapes data set          captioner/data/shapes.py
    serve     a local demo page                                     captioner/serving/server.py
"""
