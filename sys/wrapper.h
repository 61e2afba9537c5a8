/* What the project uses from the installed Slurm: the SPANK API, the error
 * codes it returns and the version the plugin must announce. */
#include <slurm/spank.h>
#include <slurm/slurm_errno.h>
#include <slurm/slurm_version.h>
