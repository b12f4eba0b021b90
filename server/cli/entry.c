/* Entry point of the tensorvault command (the dispatcher is cli/main.c). */
#include "cli/cli.h"

int main(int argc, char **argv)
{
    return tv__cli_main(argc, argv);
}
