"""The command line front end and the parity report: the only installed code that imports transformers."""
