package io.delayq.hadoop;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's checksummed local file system, with file modes set in the JVM.
 *
 * <p>Without Hadoop's native library (pyspark from PyPI ships none), {@link RawLocalFileSystem}
 * sets the mode of every file and directory it creates by starting a {@code chmod} process.
 * Spark writes several files per micro-batch (offset and commit logs, each state partition's
 * changelog, each with its {@code .crc}), so the job's JVM started hundreds of them a minute.
 * This sets the same mode with {@link Files#setPosixFilePermissions}. Everything else is
 * Hadoop's own code.
 *
 * <p>Named by {@code fs.file.impl}; must be on the JVM's class path from its start, since
 * Hadoop resolves that name at the first use of a {@code file:} path.
 */
public class NioLocalFileSystem extends LocalFileSystem {

  public NioLocalFileSystem() {
    super(new Raw());
  }

  /** The raw (checksum-free) file system under it. */
  public static class Raw extends RawLocalFileSystem {

    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      int mode = permission.toShort();
      if ((mode & ~0777) != 0) {
        // setuid, setgid or sticky: java.nio cannot set them; Hadoop's way can.
        super.setPermission(p, permission);
        return;
      }
      try {
        Files.setPosixFilePermissions(pathToFile(p).toPath(), toPosix(mode));
      } catch (NoSuchFileException e) {
        throw new FileNotFoundException("File " + p + " does not exist");
      }
    }
  }

  private static final PosixFilePermission[] BITS = {
    // from the highest bit (owner read, 0400) to the lowest (others execute, 0001)
    PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_EXECUTE,
    PosixFilePermission.OTHERS_READ, PosixFilePermission.OTHERS_WRITE,
    PosixFilePermission.OTHERS_EXECUTE,
  };

  static Set<PosixFilePermission> toPosix(int mode) {
    Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
    for (int i = 0; i < BITS.length; i++) {
      if ((mode & (0400 >> i)) != 0) {
        set.add(BITS[i]);
      }
    }
    return set;
  }
}
