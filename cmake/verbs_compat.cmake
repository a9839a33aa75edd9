# Which newer libibverbs calls the verbs transport may use (rdma-core >= 32:
# ibv_query_gid_ex, ibv_query_gid_table; >= 35: ibv_is_fork_initialized;
# the port's flags with IBV_QPF_GRH_REQUIRED), each a GS_IB_HAVE_* definition.
# What is missing is replaced by a fallback in src/transport/verbs/verbs_compat.c
# (GID types and netdevs from sysfs gid_attrs). GS_IB_COMPAT=ON uses every
# fallback even where the calls exist, so CI builds and tests them.
# Included by src/CMakeLists.txt once libibverbs is found; adds to gradsync_usage.
option(GS_IB_COMPAT "verbs: use the fallbacks of newer libibverbs calls even where they exist" OFF)
include(CheckSymbolExists)
include(CheckCSourceCompiles)

set(CMAKE_REQUIRED_INCLUDES ${IBVERBS_INCLUDE_DIR})
set(CMAKE_REQUIRED_LIBRARIES ${IBVERBS_LIBRARY})
check_symbol_exists(ibv_query_gid_ex "infiniband/verbs.h" GS_IB_HAVE_QUERY_GID_EX)
check_symbol_exists(ibv_query_gid_table "infiniband/verbs.h" GS_IB_HAVE_QUERY_GID_TABLE)
check_symbol_exists(ibv_is_fork_initialized "infiniband/verbs.h" GS_IB_HAVE_FORK_STATUS)
check_c_source_compiles("
#include <infiniband/verbs.h>
int main(void) { struct ibv_port_attr a = {0}; return (a.flags & IBV_QPF_GRH_REQUIRED) != 0; }"
  GS_IB_HAVE_PORT_FLAGS)
unset(CMAKE_REQUIRED_INCLUDES)
unset(CMAKE_REQUIRED_LIBRARIES)

set(gs_ib_have)
foreach(have GS_IB_HAVE_QUERY_GID_EX GS_IB_HAVE_QUERY_GID_TABLE GS_IB_HAVE_FORK_STATUS GS_IB_HAVE_PORT_FLAGS)
  if(${have} AND NOT GS_IB_COMPAT)
    list(APPEND gs_ib_have ${have}=1)
  endif()
endforeach()
target_compile_definitions(gradsync_usage INTERFACE ${gs_ib_have})
if(GS_IB_COMPAT)
  message(STATUS "verbs: GS_IB_COMPAT=ON: the fallbacks of newer libibverbs calls are used")
else()
  message(STATUS "verbs: newer libibverbs calls found: ${gs_ib_have}")
endif()
