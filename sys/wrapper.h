/* What the project uses from the installed Slurm: the SPANK API, the error
 * codes it returns, the version the plugin must announce, and the one
 * libslurm call srun's plugin makes (the step's layout). */
#include <slurm/slurm.h>
#include <slurm/spank.h>
#include <slurm/slurm_errno.h>
#include <slurm/slurm_version.h>
