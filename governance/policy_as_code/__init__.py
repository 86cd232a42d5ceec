"""Policy as code: governance records kept in a YAML file, validated, planned, applied, exported.

``schema`` parses the file into typed records, ``selectors`` reads the database into the same
records, ``plan`` diffs the two (pure functions), ``apply`` carries a plan out through the
governance services, ``export`` writes the database back out as a file, and ``render`` prints a
plan for people and for CI.
"""
