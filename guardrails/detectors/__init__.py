"""The built-in worker detectors, one module per idea: ``pii``, ``secrets``, ``invisible``,
``injection``, ``toxicity`` and ``limits`` (token count, language, banned substrings).

Each imports its heavy library (Presidio, torch, scikit-learn, Lingua…) inside ``load`` only:
governance imports these classes to validate settings and must stay light.
"""
