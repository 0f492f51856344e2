/* c10d-store's client subcommands (ping, set, get, ...), for the dispatch
 * table in c10d_store_main.c. */
#ifndef C10D_STORE_SERVER_TOOL_CLI_H
#define C10D_STORE_SERVER_TOOL_CLI_H

/* argv[0] is the subcommand's name. Exit status: 0 ok, 1 the operation
 * failed (with a message on stderr), 2 bad usage. */
int c10d__store_cli_run(int argc, char **argv);

#endif
