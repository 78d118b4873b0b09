# Shared compile settings for dedit targets.
#
# With clang (the build `make` configures), lock discipline is checked at
# compile time: shared state is declared ABSL_GUARDED_BY(mu_) on an
# absl::Mutex, and a violation is a build error (-Werror=thread-safety).
function(dedit_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE
      -Wthread-safety -Werror=thread-safety)
  endif()
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
endfunction()
