"""Store: trained models and runs on disk, below the application (captioner/api.py) that loads them.

    checkpoint.py     digest-checked checkpoints, averaging
    rundir.py         RunDir: every file of a run folder, named once
    locate.py         what a model path names, by one rule; the one way its weights go into a model
    saved_config.py   configs earlier versions saved, read in today's format
    hub.py            Hub-style model folders (export, ship, share, load)
    zoo.py            the catalogue of models shipped in captioner/pretrained/
"""
