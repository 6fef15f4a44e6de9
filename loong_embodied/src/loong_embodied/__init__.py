"""loong embodied plugin: LeRobot-format robot datasets, Meta-World demonstrations, action policies."""
