"""The device half of a federated deployment: what runs on a user's phone or laptop.

* :mod:`~privasr.device.bundle` -- the model bundle the operator publishes (arrays and JSON, hash-checked);
* :mod:`~privasr.device.fmp` -- FMP's bundle: the operator writes it, a device reads it and prepares its own
  N-best lists with it (NNLM scores, rescoring weights, word ids);
* :mod:`~privasr.device.folder` -- a device folder: the user's own raw files, a ledger that uses each file
  exactly once, files that cannot be read set aside;
* :mod:`~privasr.device.node` -- a device serving a federated run (Flower messages in, updates out) and
  rescoring its own lists;
* :mod:`~privasr.device.runtime` -- the process that serves a SuperNode started with ``--isolation process``:
  it runs privasr's installed ClientApp for apps whose FAB hash the device trusts, and nothing else.

See docs/device.md and docs/privacy.md.
"""
