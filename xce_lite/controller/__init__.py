"""The controller: the single writer of the job store, the scheduler's caller, the hosts' master."""
