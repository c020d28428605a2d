"""Schedule planner (Syndicate): execution plans per comm-op, the optSched list scheduler, and MCMC search."""
