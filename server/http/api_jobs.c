/* The job routes: imports, verify, jobs list/get/cancel. */
#include "http/api_internal.h"
#include "util/internal.h"

int tv__api_h_imports(tv__api_ctx *c)
{
    return tv__seterr(&c->err, TV_E_NOT_SUPPORTED, "imports are not wired yet");
}

int tv__api_h_verify(tv__api_ctx *c)
{
    return tv__seterr(&c->err, TV_E_NOT_SUPPORTED, "verify is not wired yet");
}

int tv__api_h_jobs(tv__api_ctx *c)
{
    return tv__seterr(&c->err, TV_E_NOT_SUPPORTED, "jobs are not wired yet");
}

int tv__api_h_job(tv__api_ctx *c)
{
    return tv__seterr(&c->err, TV_E_NOT_SUPPORTED, "jobs are not wired yet");
}

int tv__api_h_job_cancel(tv__api_ctx *c)
{
    return tv__seterr(&c->err, TV_E_NOT_SUPPORTED, "jobs are not wired yet");
}
