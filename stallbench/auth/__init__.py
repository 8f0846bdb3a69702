"""Who may talk to a stallbench endpoint: the one token rule (``tokens``) of every listener
that takes one (``serve``'s Flight servers, the nodes' endpoint of a multi-node profile, the
``--live`` metrics endpoint). A wing of its own on the ground floor: the top level holds the
few rules every layer uses, and a new capability joins a wing."""
