"""The tables people read, generated from records (issue 72): README's results table, the docs' results tables and
the model cards' figures.

A record is the JSON one evaluated run wrote (``captioner recipe run`` writes them; docs/*/rows/*.json and the shipped
models' config.json ``scores`` are records): its scores, grounding figures, commands, wall times, and where it ran
(CPU, commit, date). Each generated table sits in its page between two marker lines, ``<!-- NAME:start -->`` and
``<!-- NAME:end -->``; sections.py lists every one with the function that renders it from records, writes them
(``captioner recipe report --write``) and checks them (``--check``: tests/test_reports.py runs it, so a figure typed
into a table, or a record changed under one, fails the tests).
"""
