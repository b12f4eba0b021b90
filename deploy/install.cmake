# Install-time part of deploy/CMakeLists.txt: the files that name the
# prefix, written from the prefix this install runs with (CMAKE_INSTALL_PREFIX
# here is --prefix, or the configured one; CPack's is /usr) and installed
# with file(INSTALL), which honours DESTDIR and the install manifest.
# TV_* come from the install(CODE) just before this script.
set(prefix "${CMAKE_INSTALL_PREFIX}")
string(REGEX REPLACE "/+$" "" prefix "${prefix}")
if(prefix STREQUAL "/usr")
  set(etc "/etc")
else()
  set(etc "${prefix}/etc")
endif()
file(MAKE_DIRECTORY "${TV_STAGE_DIR}")

# The unit: the binary and the configuration where this install puts them.
file(READ "${TV_SOURCE_DIR}/deploy/tensorvaultd.service" unit)
string(REPLACE "/usr/bin/tensorvaultd" "${prefix}/${TV_BINDIR}/tensorvaultd" unit "${unit}")
string(REPLACE "/etc/tensorvault/" "${etc}/tensorvault/" unit "${unit}")
string(REPLACE "file:/usr/share/doc/tensorvault/" "file:${prefix}/${TV_DOCDIR}/" unit "${unit}")
file(WRITE "${TV_STAGE_DIR}/tensorvaultd.service" "${unit}")
file(INSTALL DESTINATION "${prefix}/lib/systemd/system" TYPE FILE
     FILES "${TV_STAGE_DIR}/tensorvaultd.service")

# pkg-config: the shared library only (no static archive is installed, so
# what it links stays its own business).
file(WRITE "${TV_STAGE_DIR}/tensorvault.pc"
"prefix=${prefix}
libdir=\${prefix}/${TV_LIBDIR}
includedir=\${prefix}/${TV_INCLUDEDIR}

Name: tensorvault
Description: libtensorvault: read safetensors models from a tensorvault store or tensorvaultd
Version: ${TV_VERSION}
Libs: -L\${libdir} -ltensorvault
Cflags: -I\${includedir}
")
file(INSTALL DESTINATION "${prefix}/${TV_LIBDIR}/pkgconfig" TYPE FILE
     FILES "${TV_STAGE_DIR}/tensorvault.pc")

# The configuration: never over an existing one.
set(ini "$ENV{DESTDIR}${etc}/tensorvault/tensorvaultd.ini")
if(EXISTS "${ini}")
  file(READ "${ini}" old)
  file(READ "${TV_SOURCE_DIR}/deploy/tensorvaultd.ini" new)
  if(NOT old STREQUAL new)
    configure_file("${TV_SOURCE_DIR}/deploy/tensorvaultd.ini" "${TV_STAGE_DIR}/tensorvaultd.ini.new"
                   COPYONLY)
    file(INSTALL DESTINATION "${etc}/tensorvault" TYPE FILE
         FILES "${TV_STAGE_DIR}/tensorvaultd.ini.new")
    message(STATUS "Kept: ${ini} (this version's is tensorvaultd.ini.new beside it)")
  endif()
else()
  file(INSTALL DESTINATION "${etc}/tensorvault" TYPE FILE
       FILES "${TV_SOURCE_DIR}/deploy/tensorvaultd.ini")
endif()
