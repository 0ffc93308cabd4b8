"""Operating what is served, across releases: :mod:`.status` (what is served, and does the registry
agree?), :mod:`.sync` (make everything agree with the recorded state), :mod:`.history` (every serving
change, with who, when and why)."""
