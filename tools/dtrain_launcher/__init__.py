"""dtrainrun: starts a dtrain program on many processes and hosts through the MPI launcher it was
built with. The entry point is tools/dtrainrun; docs/running.md describes the command."""
