"""The command line (click): xce and xceadmin. Each module holds one family of commands."""
