"""Training objectives: what a training step minimises, one module per objective, as the decoder families are.

    base.py            Objective: the verbs the training loop calls (loss, after_step, on_epoch, state_dict) and
                       what an objective needs of the data (``per_image``)
    cross_entropy.py   CrossEntropy: soft attention by backpropagation (Xu et al. 2015, Eq. 14)
    location.py        hard attention under cross-entropy: Reinforce (the paper's Eq. 10-12), LeaveOneOut, Gumbel
    self_critical.py   SelfCritical: SCST on the CIDEr-D reward (Rennie et al. 2017)
    registry.py        build_objective: the class the run's section names, with what it needs

Each objective's ``train.objective`` section is a torch-free dataclass in ``captioner/objective_sections.py`` (on
the floor, where ``config.py`` reads it), registered once in its ``OBJECTIVES`` table and naming its class here
by a lazy ``"module:Class"`` path (``captioner/registration.py``). Adding an objective: its section there, its
module here, one line in ``OBJECTIVES``; ``tests/test_objective_contract.py`` then checks it with the others.
"""
