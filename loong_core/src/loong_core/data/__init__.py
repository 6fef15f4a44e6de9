"""Data contracts of the core: data modules, global-batch sampling and data balancers."""
